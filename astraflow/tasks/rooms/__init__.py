"""The rooms task: a text room-navigation game, as dataset rows and as an environment."""
