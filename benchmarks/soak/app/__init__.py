"""The soak's Django app: the job mix and the statement timer the workers load."""
