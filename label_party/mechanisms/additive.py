"""Placeholder: being written."""

from label_party.mechanisms.base import FitRequest, Mechanism


def laplace_from_request(request: FitRequest) -> Mechanism:
    raise NotImplementedError


def staircase_from_request(request: FitRequest) -> Mechanism:
    raise NotImplementedError


def exponential_from_request(request: FitRequest) -> Mechanism:
    raise NotImplementedError
