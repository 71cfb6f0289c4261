"""The predictor controller's model: configs encoded as vectors (`encoding`) and an ensemble of small MLPs that
predicts a config's score with an uncertainty (`ensemble`)."""
