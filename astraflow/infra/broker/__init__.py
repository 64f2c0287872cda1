"""A single-node Apache Kafka broker (KRaft) for development and tests, run from the Maven Central jars."""
