"""The stream's runtimes: the native one (either log backend) and faust (Kafka), their shared
processing step, pending-group state and changelog."""
