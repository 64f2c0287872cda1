"""The task feeder: dataset rows become tasks on ``{run}.tasks.{workflow}``, paced by the
trainers' progress and reordered by the curators from the stream's prompt feedback."""
