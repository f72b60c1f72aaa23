"""The model configuration schema (``model_config.proto``) and its generated Python code."""
