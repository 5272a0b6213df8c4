"""One retrieval leaderboard over every model of the suite (``python -m grounding.leaderboard``, ``make leaderboard``).

Every model is tested on the same test set with the same metric code: each LightningModule through its own
``python -m grounding test`` loop (:func:`grounding.cli.run_test_subcommand`) with its DataModule pointed at the
leaderboard's caption data, its score matrix read back (``module.scored["test"]``) and ranked by
:func:`grounding.retrieval_metrics.retrieval_metrics`; SemCLIP through its content store on top of its VLM. See
:mod:`grounding.leaderboard.board` and docs/leaderboard.md.
"""

from grounding.leaderboard.board import (
                                         COLUMNS,
                                         Leaderboard,
                                         LeaderboardError,
                                         ModelEntry,
                                         TestSet,
                                         evaluate,
                                         load_leaderboard,
                                         write_outputs,
)

__all__ = ["COLUMNS", "Leaderboard", "LeaderboardError", "ModelEntry", "TestSet", "evaluate", "load_leaderboard",
           "write_outputs"]
