"""Placeholder: being written."""

from label_party.mechanisms.base import FitRequest, Mechanism


def from_request(request: FitRequest) -> Mechanism:
    raise NotImplementedError


def debiased_rr_from_request(request: FitRequest) -> Mechanism:
    raise NotImplementedError
