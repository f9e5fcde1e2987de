//! Sequences, sampling and the generation loop.
