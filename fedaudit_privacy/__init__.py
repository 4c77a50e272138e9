"""What the site and the coordinator share of the signal privacy policy: the accounting of the
Gaussian mechanism (:mod:`fedaudit_privacy.accounting`).

A package of its own so that neither side imports the other: the coordinator
(``service/coordinator/privacy_budget.py``) and the SDK (``client_sdk/privacy_budget.py``, the
numbers of ``Participant.preview()``) both import it. It imports nothing of fedaudit and no web,
HTTP, database or deep-learning library (an import contract in ``pyproject.toml`` holds it to that).
"""
