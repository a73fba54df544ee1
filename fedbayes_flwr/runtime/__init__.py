"""What runs an experiment, whatever the transport: the run config, the experiment (data, model,
bundle), the in-process engine and the client-work and judging steps both engines share,
checkpoints, the recorder, fault injection and pure message validation.
"""
