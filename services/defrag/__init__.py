"""The defragmenter: plans moves that let blocked jobs start, and asks the placer for them."""
