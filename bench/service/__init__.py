"""``mnemos bench service`` (the main job): the whole service on LoCoMo, held out, replayed in process."""
