"""Stage 6, the SLOs: rules (`ttft_p99_ms=500`), parsed and validated, and their verdicts on a step's
figures with confidence intervals: pass, fail or inconclusive; the rules over a maximum are judged
the same at any window length (max_rules). Pure functions of a `StepResult`; the step judges its
growing window with them. Hands on each rule's verdict and measured / bound."""
