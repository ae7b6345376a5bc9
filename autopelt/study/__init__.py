"""The study a search writes and everything else reads: where it is stored (`storage`), what one trial's record
holds (`record`), and which trials answer it (`answers`)."""
