"""The stream's operators: filters, advantage estimators, mixers and orderings, and the
pipeline a config builds from them. Pure functions of their input groups and state."""
