"""The typed records of a stored audit: each detector's verdict evidence and round summary, the
aggregation's details (pydantic models whose fields are the stored JSON's keys).

Shared by the coordinator, which reads its stored audits back through them
(:mod:`service.coordinator.stored_audit`), and the API, which serves them
(``service.api.schemas.audits`` and ``reports``). They import nothing of the service: the
dataclasses the audit writes are :mod:`service.audit.verdict_types` (the same field names).
"""
