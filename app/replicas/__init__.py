"""More than one replica of the service on one database."""
