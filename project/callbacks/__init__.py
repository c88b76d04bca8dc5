"""The callbacks of a training run; configs/train.yaml lists them, one comment line each."""


def default_callbacks() -> list:
    """Guards, resilience and the run summary, for a ``Trainer`` built in Python."""
    from project.callbacks.guards import Guards
    from project.callbacks.resilience import Resilience
    from project.callbacks.summary import RunSummary

    return [Guards(), Resilience(), RunSummary()]
