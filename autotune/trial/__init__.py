"""One trial as it travels: the settings and the command built from them, what a node is asked and
answers, and why a trial failed. Imported by both sides; it loads neither Optuna nor Ray."""
