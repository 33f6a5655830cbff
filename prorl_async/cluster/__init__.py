"""Multi-node deployment: the cluster document, backend assignment and the Slurm bring-up."""

from prorl_async.cluster.assign import assign
from prorl_async.cluster.spec import ClusterSpec, LLMEntry, ServerEntry, dump_spec, load_spec

__all__ = ["ClusterSpec", "LLMEntry", "ServerEntry", "assign", "dump_spec", "load_spec"]
