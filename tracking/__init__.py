"""Layer 4, MLflow: runs (:mod:`.runs`: the store, experiments, recording a run), traces of detect/evaluate
(:mod:`.traces`), the comparison views of ``halluscope compare`` (:mod:`.views`), the model registry
(:mod:`.model_registry`) and the MLflow model defined from code (:mod:`.mlflow_model`). Imported by optimize, cli
and serve, never the other way round."""
