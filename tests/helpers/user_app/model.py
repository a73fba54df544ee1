"""The model both apps of the user app build: a model object, not a registered name (each app
registers it under the same stable name, in every process it runs in)."""

from fedbayes_flwr.models import LogisticRegression

MODEL = LogisticRegression.build()
NUM_FEATURES = 4
