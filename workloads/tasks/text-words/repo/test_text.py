import unittest

from text import count_words


class TextTest(unittest.TestCase):
    def test_count_words(self):
        self.assertEqual(count_words("a b c"), 3)
        self.assertEqual(count_words("one"), 1)


if __name__ == "__main__":
    unittest.main()
