"""Models out: the model card of every saved folder (:mod:`.card`) and the upload of a folder to
the Hugging Face Hub (:mod:`.push`)."""
