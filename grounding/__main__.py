"""``python -m grounding`` and the ``grounding`` console script: the CLI (grounding/cli.py), with the Hugging Face hub
offline unless the user asks otherwise."""

from grounding.errors import offline_hub_by_default


def main() -> None:
    offline_hub_by_default()  # before transformers is imported: it reads HF_HUB_OFFLINE once
    from grounding.cli import run_command  # here: after the offline default above

    run_command()


if __name__ == "__main__":
    main()
