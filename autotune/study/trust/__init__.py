"""The study's answer and what makes it trustworthy: the run-to-run noise, knobs screened out, when the
search stops, the node-hour budget, the winner confirmed. The loop (autotune.study.loop) calls these
between trials; nothing here drives a trial."""
