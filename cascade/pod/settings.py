"""The settings every model pod (drafter, verifier) shares, each declared once; a role's class
extends them with its own (``drafter_service.settings``, ``verifier_service.settings``) and its
command line is generated from the whole (``cascade.serving.settings_cli``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from cascade.serving.mesh.security import MeshSettings
from cascade.serving.settings_cli import env


DTYPES = ("auto", "float32", "bfloat16", "float16")


def _known_dtype(value: str) -> str:
    if value not in DTYPES:
        raise ValueError(f"must be one of {', '.join(DTYPES)}, got {value!r}")
    return value


Dtype = Annotated[str, AfterValidator(_known_dtype)]


class PodSettings(BaseModel):
    """A model pod's flags."""

    model_config = ConfigDict(frozen=True, protected_namespaces=())

    model: str = Field(description="The pod's model: a local folder or a hub name.")
    dtype: Dtype = Field("auto", description="float32, bfloat16, float16 or auto (bfloat16 on a "
                       "GPU or a CPU that runs it fast, measured; float32 elsewhere).")
    device: str = Field("cpu", description="torch device, e.g. cpu or cuda:0.")
    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(0, ge=0, le=65535, description="Port to bind (0 picks a free one).")
    advertise: str | None = Field(None, description="host:port others use to reach this pod.")
    grace_s: float = Field(10.0, ge=0, description="Seconds in-flight streams get when "
                           "draining.")
    threads: int = Field(0, ge=0, description="torch threads (0 keeps torch's default).")
    metrics_port: int = Field(0, ge=0, le=65535, description="Serve Prometheus /metrics here "
                              "(0: off), on --host.")
    model_name: str = Field("", description="The served model's name in metrics' model_name "
                            "label (default: the target folder's name, as the gateway's "
                            "--model-name).")
    target_model: str | None = Field(None, description="When --model is a feature drafter: the "
                                     "target's folder, whose embedding and head it shares.")
    mesh: MeshSettings = MeshSettings()
    health_port: int | None = Field(None, ge=0, le=65535, description="Also serve gRPC health "
                                    "alone, in plaintext, on this port (for probes when the main "
                                    "port speaks mutual TLS).",
                                    json_schema_extra=env("CASCADE_HEALTH_PORT"))
    allow_open: bool = Field(False, description="Serve without --tls-dir or a mesh token "
                             "(otherwise refused): for local development.")
