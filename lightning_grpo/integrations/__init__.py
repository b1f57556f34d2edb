"""Environments and tasks from other frameworks, trained unchanged (docs/guide/environments.md).

One module per framework, each needing its own optional extra, imported on first use:

- :mod:`~lightning_grpo.integrations.openenv`: OpenEnv environments, in-process
  (:class:`~lightning_grpo.integrations.openenv.OpenEnvEnvironment`) or served
  (:class:`~lightning_grpo.integrations.openenv.OpenEnvClientEnvironment`); extra ``openenv``.
- :mod:`~lightning_grpo.integrations.trl`: TRL-style ``environment_factory`` classes
  (:class:`~lightning_grpo.integrations.trl.TRLEnvironment`); no extra (TRL itself is not needed).
- :mod:`~lightning_grpo.integrations.verifiers`: verifiers v1 tasksets as records and their
  ``@vf.reward`` methods as reward functions; extra ``verifiers``.

The environment adapters are :class:`~lightning_grpo.agents.Environment` classes: give their import
path as ``rollout.agent.environment`` (`AgentSettings`) and their arguments as ``environment_args``.
``openenv-core`` and ``verifiers`` pin different ``mcp`` versions: install one of the two extras.
"""
