"""Numbers per image (a count, an age, a score): a labels table with numeric columns instead of
a label; the network learns them standardised, every metric and answer is in their own units.
Torch-free here."""
