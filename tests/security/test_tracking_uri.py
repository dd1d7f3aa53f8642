"""A sweep's `mlflow.uri` never carries a password: it is copied into every run config and
MLflow param, so one in the URI is refused at parse time, before any job starts."""

import pytest

from sweep import SweepError, parse_sweep


def sweep_with_uri(uri: str) -> dict:
    return {"name": "s", "methods": ["GRPO"], "eval": {"steps": [1], "benchmarks": ["toy"]},
            "mlflow": {"uri": uri}}


def test_password_in_the_uri_is_refused_without_echoing_it():
    with pytest.raises(SweepError) as err:
        parse_sweep(sweep_with_uri("http://alice:hunter2-secret@mlflow.lab:5000"), "s.yaml")
    message = str(err.value)
    assert "s.yaml" in message and "mlflow.uri" in message
    assert "MLFLOW_TRACKING_PASSWORD" in message and "hunter2-secret" not in message


@pytest.mark.parametrize("uri", ["http://127.0.0.1:5000", "http://alice@mlflow.lab:5000",
                                 "sqlite:////tmp/mlflow.db", "https://mlflow.lab"])
def test_uris_without_a_password_pass_unchanged(uri):
    assert parse_sweep(sweep_with_uri(uri), "s.yaml").mlflow_uri == uri
