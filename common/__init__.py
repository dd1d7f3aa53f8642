"""The bottom layer that trainer, eval, sweep and analysis all stand on: file formats and
the run-directory layout (`common.files`, `common.layout`)."""
