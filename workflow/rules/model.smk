# The embedded default's policy: a tiny HF model, warm-started on the toy task (CPU, offline).
# The repository ships it (data/tiny-model, built by `python -m trainer tiny` under
# ATEN_CPU_CAPABILITY=default): the warm start's float reductions depend on the CPU's kernels,
# so a model built here would give every run of the sweep a machine-dependent starting point.
# The shipped bytes are copied whenever the sweep's `tiny:` settings are the ones they were
# built with; other settings, or `tiny: {rebuild: true}`, build it here instead.
import json
from pathlib import Path

from trainer.pretrained import is_prepared

SHIPPED_TINY = Path(workflow.basedir) / "data" / "tiny-model"
USE_SHIPPED_TINY = (
    not SWEEP.tiny.rebuild
    and (SHIPPED_TINY / "tiny_config.json").is_file()
    and json.loads((SHIPPED_TINY / "tiny_config.json").read_text())
    == SWEEP.tiny.builder_config().model_dump()
)


rule tiny_model:
    output:
        directory(MODEL_DIR),
    params:
        shipped=str(SHIPPED_TINY),
        args=SWEEP.tiny.cli_args(),
    conda:
        "../envs/harness.yaml"
    log:
        str(LAYOUT.log("tiny_model")),
    benchmark:
        str(LAYOUT.benchmark("tiny_model"))
    shell:
        (
            "mkdir -p {output} && cp {params.shipped}/* {output}/ > {log} 2>&1"
            if USE_SHIPPED_TINY
            else "python -m trainer tiny --out {output} {params.args} > {log} 2>&1"
        )


# A named pretrained model (trainer.pretrained: `model.path: smollm2-135m-instruct`),
# converted once from its wheel's GGUF file into an HF folder every sweep under the results
# directory reads (common.layout.prepared_model_dir).
PREPARED_NAME = str(SWEEP.base.get("model", {}).get("path", ""))
if is_prepared(PREPARED_NAME):

    rule prepare_model:
        output:
            directory(str(MADE_MODEL)),
        params:
            name=PREPARED_NAME,
        conda:
            "../envs/harness.yaml"
        log:
            str(LAYOUT.log("prepare_model")),
        benchmark:
            str(LAYOUT.benchmark("prepare_model"))
        shell:
            "python -m trainer prepare {params.name} --out {output} > {log} 2>&1"
