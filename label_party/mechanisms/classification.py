"""Placeholder: being written."""

from label_party.mechanisms.base import FitRequest, Mechanism


def rr_from_request(request: FitRequest) -> Mechanism:
    raise NotImplementedError


def rr_with_prior_from_request(request: FitRequest) -> Mechanism:
    raise NotImplementedError
