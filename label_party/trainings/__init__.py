"""LabelDP-Pro trainings: a release whose message is a trained model.

The features party uploads public features and a training spec
(``POST /v1/datasets/{id}/trainings``); the request's transaction reserves the
spec's (ε, δ) in the ledger and queues the training; a labels-party worker
(``labeldp label-party worker``) joins the features with the private labels,
trains by DP-SGD with a projection denoiser (:mod:`label_party.labeldp_pro`) and
stores the model artifact, which downloads like a release.
"""
