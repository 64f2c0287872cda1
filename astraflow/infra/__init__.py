"""What runs the system: the development broker (``broker``) and the launcher that supervises
every component as a process on one machine (``launch``)."""
