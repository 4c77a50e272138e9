"""The detectors, one per module (the results they share: :mod:`service.audit.detection`).

* :mod:`~service.audit.detectors.fednoro` -- FedNoRo's per-class loss mixture (section 4.1), with
  its features and the mixture fits' vote in :mod:`~service.audit.detectors.fednoro_mixture`.
* :mod:`~service.audit.detectors.separation` -- the statistics of FedNoRo's separation guard
  (Ashman's D, its null threshold, the class-standardised loss excess).
* :mod:`~service.audit.detectors.fedncl` -- Fed-NCL's reliability score and sigma rule
  (section V-A), model divergence (eq. 7) and correction candidates (eq. 17).
* :mod:`~service.audit.detectors.expertise` -- FedRN data expertise (eq. 4).

The calibrated evidence detector is :mod:`service.audit.evidence`.
"""
