"""Tools that the wheel does not ship (the sm_70 projection model); run from a source checkout."""
