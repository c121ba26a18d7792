"""An example of a task of one's own: a small transformer that reads an 8x8 digit as 8 rows."""
