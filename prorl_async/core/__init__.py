"""The job and its life: the job record, the stage pipeline, results, the handler interface."""
