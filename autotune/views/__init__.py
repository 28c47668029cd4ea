"""What a person sees of a study: the report, plots, the best config compared with the defaults, the
MLflow UI."""
