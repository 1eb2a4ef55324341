"""Stage 7, the step: one load held against the server, a warm-up, a measurement window, a drain.
The load's driver decides when to send (replay.load.drivers), the window when to stop
(replay.step.window), and one pure function turns the records, the metric snapshots and the SLOs
into the figures (replay.step.figures). Hands on a `StepResult`."""
