"""The fields of vLLM-Omni's own speech request models, read from its published wheel (installed in
.venv-clients without its dependencies): printed as JSON for tests/integration/api/test_vllm_omni_fields.py.

Only ``entrypoints/openai/protocol/audio.py`` is loaded, by its path: the package's ``__init__``
imports vLLM itself, which is not installed. That file needs only pydantic and numpy.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from importlib.metadata import distribution

PROTOCOL = "vllm_omni/entrypoints/openai/protocol/audio.py"


def main() -> int:
    dist = distribution("vllm-omni")
    (path,) = [f for f in dist.files or [] if str(f) == PROTOCOL]
    spec = importlib.util.spec_from_file_location("vllm_omni_audio_protocol", str(dist.locate_file(path)))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out: dict[str, object] = {"version": dist.version}
    for model in ("OpenAICreateSpeechRequest", "BatchSpeechRequest", "SpeechBatchItem"):
        fields = getattr(module, model).model_fields
        out[model] = {
            name: sorted(
                {name, *(getattr(field.validation_alias, "choices", None) or [])} - {None}  # type: ignore[arg-type]
            )
            for name, field in fields.items()
        }
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
