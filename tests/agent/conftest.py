from tests.agent.protocol import start_job, stepscope_dir  # noqa: F401  (fixtures)
