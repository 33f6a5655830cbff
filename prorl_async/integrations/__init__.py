"""Trainers on the service: adapters that make it a framework's rollout backend
(``integrations.trl`` for TRL's ``GRPOTrainer``). Each imports its framework only when
used, so the project's own install never needs torch."""
