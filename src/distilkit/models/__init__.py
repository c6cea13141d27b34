"""Teacher, students and the Features view of their internals."""
