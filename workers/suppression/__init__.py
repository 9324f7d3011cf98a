"""The suppression worker: outcomes into suppression scores."""
