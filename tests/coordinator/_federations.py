"""A federation row made through the coordinator's use case, for tests that need one in the
database (and nothing else: no clients, no model)."""

from __future__ import annotations

import uuid

from sqlalchemy.orm import Session

from service.coordinator import federations
from service.coordinator.federation_config import FederationConfigInput


def new_federation(session: Session, name: str, *, method: str = "fedavg") -> uuid.UUID:
    """A two-class federation called ``name`` with the ``method`` preset; its id."""
    return federations.create_federation(
        session,
        name=name,
        num_classes=2,
        input_shape=[2],
        class_names=None,
        rounds=30,
        min_clients=1,
        max_clients=None,
        round_deadline_s=600,
        config=FederationConfigInput(method=method),
        seed=1,
        actor="admin",
    ).id
