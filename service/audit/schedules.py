"""Scaling of the papers' round schedules to a federation's planned length.

docs/algorithms.md, "Status and warm-up": a schedule value given in rounds for a paper's run length
(FedNoRo 100 rounds, FedRN 500, Fed-NCL 150, RoFL 1000, FLR 300) is scaled by planned / paper
length, rounded, and at least 1.
"""

from __future__ import annotations

from service.audit._validation import check_int

__all__ = ["scale_rounds"]


def scale_rounds(paper_value: int, paper_rounds: int, planned_rounds: int) -> int:
    """Scale a schedule value from the paper's run length to the planned one.

    ``max(1, round(paper_value * planned_rounds / paper_rounds))``, rounding halves up (not
    to even, so 2.5 gives 3), computed in exact integer arithmetic.

    Parameters
    ----------
    paper_value : int
        The value in the paper, in rounds (>= 0).
    paper_rounds : int
        The paper's run length (>= 1).
    planned_rounds : int
        The federation's planned number of rounds (>= 1).

    Returns
    -------
    int
        The scaled value, at least 1.

    Raises
    ------
    InvalidParameterError
        If an argument is not an int or out of range.
    """
    value = check_int("paper_value", paper_value, min_value=0)
    paper = check_int("paper_rounds", paper_rounds, min_value=1)
    planned = check_int("planned_rounds", planned_rounds, min_value=1)
    return max(1, (2 * value * planned + paper) // (2 * paper))
