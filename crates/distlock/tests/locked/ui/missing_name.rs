#[distlock::locked(locks = locks)]
async fn report(locks: &distlock::Locks) -> distlock::Result<()> {
    Ok(())
}

fn main() {}
