"""The aggregation rules, one family per module (the dispatcher by name:
:mod:`service.audit.aggregation`).

* :mod:`~service.audit.aggregators.fedavg` -- FedAvg (FedRN eq. 1, McMahan et al. 2017) and the
  reliability-weighted average (beyond the papers).
* :mod:`~service.audit.aggregators.daagg` -- FedNoRo's distance-aware aggregation (eq. 6-7).
* :mod:`~service.audit.aggregators.fedncl_layerwise` -- Fed-NCL's robust layer-wise aggregation
  with the noisy-client penalty (section V-B, eq. 12-16).
* :mod:`~service.audit.aggregators.robust` -- the coordinate-wise trimmed mean and median.
* :mod:`~service.audit.aggregators.common` -- ``AggregationResult``, the input checks, the
  weighted sum of the updates and the fall-back to FedAvg.
* :mod:`~service.audit.aggregators.weight_cap` -- the cap on a single client's weight.
"""
