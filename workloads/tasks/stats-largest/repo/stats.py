def largest(xs):
    return min(xs)


def total(xs):
    return sum(xs)
