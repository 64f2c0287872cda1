"""The Kafka log: the ``Log`` API over confluent-kafka (librdkafka) against a real broker."""
