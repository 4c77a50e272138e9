"""The ClientApp side: compute fedaudit's signals with the SDK's code and put them in a reply.

In a Flower ``ClientApp``'s ``@app.train()`` function, after local training::

    record = signals_record(
        global_model=received_model,   # theta_G as received, before training
        local_model=model,             # theta_k after training
        data=LocalData(inputs, labels),
        num_classes=10,
        train_loss=train_loss,
    )
    content = RecordDict({"arrays": ..., "metrics": ..., SIGNALS_KEY: record})

The signals are those of :func:`client_sdk.signals.compute_signals`, the function a fedaudit
site's ``Participant`` uses; :mod:`fedaudit_flower._records` describes their layout.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import ConfigRecord
from torch import nn

from client_sdk._responses import SignalPolicy
from client_sdk.privacy import private_signals
from client_sdk.recipes.base import DeviceLike, LocalData, TrainReport
from client_sdk.recipes.errors import SignalError
from client_sdk.signals import compute_signals
from fedaudit_flower._records import PRIVACY_PREFIX, WireSignals, encode_signals

__all__ = ["DEFAULT_SIGNALS", "privacy_policy", "signals_record"]

DEFAULT_SIGNALS = ("per_class_loss", "train_loss", "train_accuracy")
"""What the default audit reads: per-class loss and its spread (the calibrated evidence,
FedNoRo), the training loss (Fed-NCL) and the accuracy on the site's labels (FedRN expertise)."""


def signals_record(
    *,
    global_model: nn.Module,
    local_model: nn.Module,
    data: LocalData,
    num_classes: int,
    train_loss: float | None = None,
    required: Collection[str] = DEFAULT_SIGNALS,
    probe_seed: int | None = None,
    probe_size: int = 64,
    input_shape: Sequence[int] | None = None,
    device: DeviceLike = "cpu",
    batch_size: int = 256,
    policy: SignalPolicy | None = None,
    rng: np.random.Generator | None = None,
) -> ConfigRecord:
    """Compute the site's signals for this round and return them as a ``ConfigRecord``.

    Parameters
    ----------
    global_model : torch.nn.Module
        theta_G as received this round, before local training (the per-class loss is
        measured with it).
    local_model : torch.nn.Module
        theta_k after local training.
    data : client_sdk.LocalData
        The site's training set, with the labels it trained on.
    num_classes : int
        C.
    train_loss : float, optional
        The mean training cross-entropy; needed when ``required`` holds ``"train_loss"``.
    required : collection of str
        Signals to compute (``client_sdk.signals.OPTIONAL_SIGNALS``); num_samples and
        class_counts are always sent.
    probe_seed, probe_size, input_shape
        The round's probe (``"probe_softmax"`` only); ``input_shape`` defaults to the data's.
    device : torch.device or str
        Where the models are.
    batch_size : int
        Evaluation batch size.
    policy : client_sdk.SignalPolicy, optional
        The federation's signal privacy policy (:func:`privacy_policy` reads the one
        :class:`~fedaudit_flower.FedAuditStrategy` puts in the round's config). It is applied
        as a fedaudit site's ``Participant`` applies it, by the same functions: per-sample
        losses clipped to ``dp_clip_loss`` under the Gaussian mechanism
        (``compute_signals(loss_clip=...)``), then :func:`client_sdk.privacy.private_signals`
        (suppressed classes, rounded counts, the noise). None: no policy.
    rng : numpy.random.Generator, optional
        The mechanism's noise (``numpy.random.default_rng()`` when None, as in the SDK).

    Returns
    -------
    flwr.app.ConfigRecord
        To be put in the reply's ``RecordDict`` under ``fedaudit_flower.SIGNALS_KEY``.

    Raises
    ------
    client_sdk.SignalError
        On an unknown signal, a missing input (``train_loss``, probe seed) or a non-finite
        value.
    """
    wanted = set(required)
    if "train_loss" in wanted and train_loss is None:
        raise SignalError("train_loss: required, but none was given")
    report = TrainReport(train_loss=0.0 if train_loss is None else float(train_loss), num_steps=0)
    signals = compute_signals(
        global_model=global_model,
        local_model=local_model,
        data=data,
        num_classes=num_classes,
        required=wanted,
        train_report=report,
        probe_seed=probe_seed,
        probe_size=probe_size,
        input_shape=tuple(data.inputs.shape[1:]) if input_shape is None else input_shape,
        device=device,
        batch_size=batch_size,
        loss_clip=policy.dp_clip_loss if policy is not None and policy.dp_active else None,
    )
    if policy is None:
        return encode_signals(signals)
    exact = signals.to_json()  # what the SDK's update reports (reported_signals) and n_k
    num_samples, sent = private_signals(exact.pop("num_samples"), exact, policy, rng=rng)
    fields: dict[str, Any] = {name: sent.get(name) for name in WireSignals.__dataclass_fields__}
    fields["num_samples"] = num_samples
    return encode_signals(WireSignals(**fields))


def privacy_policy(config: Mapping[str, Any]) -> SignalPolicy | None:
    """The privacy policy :class:`~fedaudit_flower.FedAuditStrategy` put in a training
    message's config (its ``fedaudit.privacy.*`` entries), or None when it has none.

    Pass the message's ``ConfigRecord`` (``msg.content["config"]``) and the result to
    :func:`signals_record` as ``policy``.
    """
    settings = {
        key.removeprefix(PRIVACY_PREFIX): value
        for key, value in config.items()
        if key.startswith(PRIVACY_PREFIX)
    }
    if not settings:
        return None
    for name in ("dp_clip_loss", "dp_clip_probe", "dp_delta"):
        if name in settings and settings[name] is not None and float(settings[name]) <= 0.0:
            settings[name] = None  # a record holds no None: 0 stands for unset
    return SignalPolicy.model_validate(settings)
