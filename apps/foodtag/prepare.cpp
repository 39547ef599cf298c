#include "apps/foodtag/prepare.hpp"
