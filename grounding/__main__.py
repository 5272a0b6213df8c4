from grounding.errors import offline_hub_by_default

offline_hub_by_default()  # before transformers is imported: it reads HF_HUB_OFFLINE once

from grounding.cli import run_command  # noqa: E402  (after the offline default above)

run_command()
