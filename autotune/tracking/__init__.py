"""MLflow records of a study: one parent run, one child run per trial."""
