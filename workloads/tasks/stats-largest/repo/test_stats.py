import unittest

from stats import largest, total


class StatsTest(unittest.TestCase):
    def test_largest(self):
        self.assertEqual(largest([3, 9, 4]), 9)

    def test_total(self):
        self.assertEqual(total([1, 2, 3]), 6)


if __name__ == "__main__":
    unittest.main()
